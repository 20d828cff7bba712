"""What the engines share beyond the math: the cluster runtime, the fast-memory tiers and
the strategies that decide which block runs next and which data stays resident."""
