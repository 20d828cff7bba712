"""Coordinate and dual coordinate descent on one machine: scd, sdca, gram, duhl, sdca out of core."""
