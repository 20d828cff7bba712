"""Checkpoints: the fit's whole state in one file, written atomically.

The block-SCD engine recomputes the margins from (θ, b) at the start of every epoch, so
θ, b, the epoch, the random generator's state and the history are all it needs to
continue exactly where it stopped: a resumed fit gives the same model, bit for bit.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dask_scd.data.files import write_atomically
from dask_scd.progress import epoch_info
from dask_scd.result import History

_VERSION = 1


def save_checkpoint(
    path,
    *,
    coef,
    intercept,
    epoch,
    rng,
    history: History,
    signature: dict,
    engine: dict | None = None,
):
    """Write the state to ``path`` (an .npz file) through a temporary file and a rename."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    meta = {
        "version": _VERSION,
        "epoch": int(epoch),
        "intercept": float(intercept),
        "rng_state": rng.bit_generator.state,
        "history": history.as_dict(),
        "signature": signature,
        "engine": engine or {},
    }
    coef = np.asarray(coef, dtype=np.float64)
    write_atomically(path, lambda f: np.savez(f, coef=coef, meta=np.array(json.dumps(meta))))


def load_checkpoint(path, signature: dict, rng) -> dict | None:
    """The saved state, or None if there is no checkpoint at ``path``.

    Restores ``rng`` in place. A checkpoint of another problem (loss, penalty, data shape,
    blocks...) raises ValueError rather than silently continuing the wrong fit.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            coef = np.asarray(saved["coef"], dtype=np.float64).copy()
            meta = json.loads(str(saved["meta"]))
        if not isinstance(meta, dict) or not isinstance(meta.get("signature"), dict):
            raise ValueError("no signature")
    except Exception as exc:  # not an .npz, truncated, another program's file...
        raise ValueError(
            f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); "
            "remove it or pass resume=False"
        ) from exc
    if meta.get("version") != _VERSION:
        raise ValueError(f"checkpoint {path} has unsupported version {meta.get('version')!r}")
    if meta["signature"] != signature:
        changed = sorted(k for k in signature if meta["signature"].get(k) != signature[k])
        raise ValueError(
            f"checkpoint {path} belongs to another fit (differs in {changed}); "
            "remove it or pass resume=False"
        )
    if coef.shape != (signature["shape"][1],):
        raise ValueError(
            f"checkpoint {path} holds {coef.shape} coefficients for "
            f"{signature['shape'][1]} features; remove it or pass resume=False"
        )
    try:
        rng.bit_generator.state = meta["rng_state"]
        return {
            "coef": coef,
            "intercept": float(meta["intercept"]),
            "epoch": int(meta["epoch"]),
            "history": History.from_dict(meta["history"]),
            "engine": dict(meta.get("engine") or {}),
        }
    except Exception as exc:
        raise ValueError(
            f"checkpoint {path} is damaged ({type(exc).__name__}: {exc}); "
            "remove it or pass resume=False"
        ) from exc


class EpochHooks:
    """What runs after every epoch: the checkpoint and the user's callback.

    ``checkpoint`` (a path) is written atomically every ``every`` epochs and at the
    last, with the RNG state and a ``signature`` of the fit that a resume must
    match; ``callback(info) -> True`` stops the fit (``info``:
    :func:`~dask_scd.progress.epoch_info`, with ``coef`` and ``intercept``).
    """

    def __init__(self, checkpoint=None, every=1, resume=False, callback=None, signature=None):
        self.checkpoint, self.every, self.resume = checkpoint, every, resume
        self.callback, self.signature = callback, signature

    def load(self, rng):
        """The saved state (coef, intercept, epoch, history) to resume from, or None."""
        if not (self.resume and self.checkpoint):
            return None
        return load_checkpoint(self.checkpoint, self.signature, rng)

    def after_epoch(
        self, epoch, coef, intercept, cert, history, rng, last, original_order, engine=None
    ) -> bool:
        """Checkpoint if due (every ``every`` epochs, and the ``last``); call the callback.
        Returns True to stop. ``engine``: the engine's own state (JSON), saved with the
        checkpoint for a resume to continue with the same steps."""
        if self.checkpoint and (epoch % self.every == 0 or last):
            save_checkpoint(
                self.checkpoint,
                coef=coef,
                intercept=intercept,
                epoch=epoch,
                rng=rng,
                history=history,
                signature=self.signature,
                engine=engine,
            )
        if self.callback is None:
            return False
        seconds = history.seconds[-1] if len(history) else 0.0
        info = epoch_info(
            epoch,
            cert.relative_gap,
            cert.primal,
            seconds,
            coef=original_order(coef),
            intercept=intercept,
        )
        return bool(self.callback(info))
