"""The engines' own keyword options: one frozen dataclass per engine, its defaults, what
each option means and the check of its values, declared once.

``fit(X, y, solver=..., **options)`` passes the keywords left after its own to the
engine's class (:func:`engine_options`): an unknown name is a TypeError that lists the
names the engine takes, a bad value a ValueError from the field's check. The engine then
receives the instance as ``Options.engine`` (:mod:`dask_scd.engines.base`). What depends
on the data or the device (a grid's options on in-memory X, threads on a GPU) the engine
checks itself.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields

import numpy as np

from dask_scd.runtime.strategies import BLOCK_ORDERS, RESIDENCIES

IN_MEMORY_LIMIT = 256 * 2**20
CHUNK_ORDERS = ("random", "sequential")
AGGREGATIONS = ("adaptive", "average", "add")
SPLITS = ("auto", "features", "examples")


def option(default, check=None, doc: str = "", where: str | None = None):
    """A field of an engine's options: its default, its check ``check(name, value)``, what
    it means, and ``where`` it applies when not everywhere ("grid": on a Grid only,
    "cluster": on a dask array or a Grid only)."""
    return field(default=default, metadata={"check": check, "doc": doc, "where": where})


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _integer(least: int, what: str, none: bool = False):
    """The check of an integer of at least ``least`` (or None, when ``none``)."""

    def check(name: str, value) -> None:
        if not (none and value is None) and (not _is_int(value) or value < least):
            raise ValueError(f"{name} must be {what}, got {value!r}")

    return check


positive_int = _integer(1, "a positive integer")
non_negative_int = _integer(0, "a non-negative integer")
positive_int_or_none = _integer(1, "a positive integer or None", none=True)


def one_of(choices: tuple):
    def check(name: str, value) -> None:
        if value not in choices:
            raise ValueError(f"{name}={value!r} is not one of {choices}")

    return check


def in_range(low: float, high: float):
    def check(name: str, value) -> None:
        if not (isinstance(value, (int, float, np.number)) and low <= value <= high):
            raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value!r}")

    return check


def callable_or_none(name: str, value) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be a callable or None, got {value!r}")


def flag_or_directory(name: str, value) -> None:
    if not isinstance(value, (bool, str, os.PathLike)):
        raise ValueError(f"{name} must be True, False or a directory, got {value!r}")
    if not isinstance(value, bool) and not os.path.isdir(value):
        raise ValueError(f"{name}={value!r} is not a directory")


@dataclass(frozen=True)
class EngineOptions:
    """Options every field of which is checked when the instance is made."""

    def __post_init__(self):
        for f in fields(self):
            if f.metadata.get("check") is not None:
                f.metadata["check"](f.name, getattr(self, f.name))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def changed(self, where: str | None = None) -> list[str]:
        """The options (of those that apply only ``where``, if given) set to other than
        their defaults."""
        return sorted(
            f.name
            for f in fields(self)
            if (where is None or f.metadata.get("where") == where)
            and (f.default is MISSING or getattr(self, f.name) != f.default)
        )


def engine_options(engine, given: dict, solver: str, data_options: bool = False):
    """``engine``'s options (:class:`EngineOptions`) from the keywords ``given``; an unknown
    one is a TypeError that names the keywords of the solver asked for (or of the engine
    that ``auto`` chose), with fit's own for dask input when ``data_options``."""
    unknown = sorted(set(given) - set(engine.options.names()))
    if unknown:
        valid = [*engine.options.names(), *(DataOptions.names() if data_options else ())]
        which = (
            f"solver='auto' runs {engine.name!r} on this data, which"
            if solver == "auto"
            else f"solver={solver!r}"
        )
        takes = f"takes {', '.join(valid)}" if valid else "takes no keyword arguments"
        raise TypeError(f"unknown keyword arguments {unknown} for dask_scd.fit: {which} {takes}")
    return engine.options(**given)


@dataclass(frozen=True)
class NoOptions(EngineOptions):
    """An engine without options of its own."""


def callback_option():
    """The ``callback`` field that an engine's options declare where the engine calls it
    after each certified epoch (every engine does: :func:`dask_scd.progress.epoch_info`
    says what it receives), last among them."""
    return option(
        None,
        callable_or_none,
        "called after every certified epoch (or Newton step) with {epoch, relative_gap, "
        "primal, seconds} (the block engines add coef and intercept); True stops the fit",
    )


@dataclass(frozen=True)
class EpochOptions(EngineOptions):
    """The options of an engine without options of its own but the ``callback``."""

    callback: object = callback_option()


@dataclass(frozen=True)
class DataOptions(EngineOptions):
    """``fit``'s own options for a dask array or a Grid, whatever the engine."""

    blocks: object = option(None, doc="column blocks of a dask array (default: its chunks)")
    in_memory_limit: int = option(
        IN_MEMORY_LIMIT,
        doc="bytes (stored: the non-zeros of sparse chunks) below which auto fits in memory",
    )


@dataclass(frozen=True)
class SDCAOptions(EngineOptions):
    """SDCA's options (:mod:`dask_scd.engines.local.sdca`); on a Grid, out of core
    (:mod:`dask_scd.engines.local.sdca_grid`), one thread and the last three."""

    n_threads: int = option(
        1, positive_int, "threads of the epochs, sharing w without locks (SA-SDCA)"
    )
    sync_every: int = option(
        1, non_negative_int, "epochs between two recomputations of w from the duals (0: never)"
    )
    check_every: int | None = option(
        None,
        positive_int_or_none,
        "certify every k epochs and at the last (None: the in-memory schedule)",
        where="grid",
    )
    chunk_order: str = option(
        "random",
        one_of(CHUNK_ORDERS),
        "row chunks in a fresh permutation each epoch, or in storage order",
        where="grid",
    )
    spill: bool | str | os.PathLike = option(
        False,
        flag_or_directory,
        "a dense grid's row chunks kept decoded in a temporary file (True: the system's "
        "temporary directory; or a directory) after their first read",
        where="grid",
    )
    callback: object = callback_option()


@dataclass(frozen=True)
class DuHLOptions(EngineOptions):
    """DuHL's options (:mod:`dask_scd.engines.local.duhl`)."""

    memory_budget: int | None = option(
        None, doc="bytes of fast memory (default a quarter of X; less than a chunk is an error)"
    )
    local_epochs: int = option(
        2, positive_int, "epochs of the coordinate kernel on the resident lines per round"
    )
    residency: str = option(
        "duhl", one_of(RESIDENCIES), "which chunks are resident each round (runtime.strategies)"
    )
    chunk_size: int | None = option(
        None,
        positive_int_or_none,
        "lines (columns in the primal, rows in the dual) per chunk (default: about 256 chunks)",
    )
    gap_refresh: float = option(
        0.1,
        in_range(0.0, 1.0),
        "fraction of the lines whose gap the slow side refreshes in a round not certified",
    )
    certify_every: int = option(
        1, positive_int, "rounds between certificates (a full pass of the slow side)"
    )
    callback: object = callback_option()


@dataclass(frozen=True)
class BlockNewtonOptions(EngineOptions):
    """The options of a fit on the cluster (:mod:`dask_scd.engines.block`)."""

    client: object = option(
        None,
        doc="distributed.Client (default the current one, else a local cluster)",
        where="cluster",
    )
    selection: str = option(
        "shuffle",
        one_of(BLOCK_ORDERS),
        "block order within an epoch: a fresh permutation, the grid's, or by block gap",
    )
    checkpoint: object = option(
        None, doc="file (.npz) written atomically every checkpoint_every epochs", where="cluster"
    )
    checkpoint_every: int = option(1, doc="epochs between two checkpoints", where="cluster")
    resume: bool = option(False, doc="continue from checkpoint if it exists", where="cluster")
    callback: object = callback_option()


@dataclass(frozen=True)
class BlockSCDOptions(BlockNewtonOptions):
    """Block SCD's options: block Newton's, and the residency policies of a grid."""

    residency: str | None = option(
        None,
        doc="a grid only: each epoch updates the blocks this policy makes resident within "
        "memory_budget (default: every block, every epoch)",
        where="cluster",
    )
    memory_budget: int | None = option(
        None, doc="bytes of cells over the whole grid (default a quarter of it)", where="cluster"
    )


@dataclass(frozen=True)
class CoCoAOptions(EngineOptions):
    """CoCoA's options (:mod:`dask_scd.engines.cocoa.cocoa`)."""

    client: object = option(None, doc="dask input: default the current client, else a local one")
    n_partitions: int | None = option(
        None,
        positive_int_or_none,
        "K, the parts (default 4 in memory; the dask workers, at most the blocks)",
    )
    local_epochs: int = option(1, positive_int, "epochs of the local solver per part and round")
    aggregation: str = option(
        "adaptive",
        one_of(AGGREGATIONS),
        "γ of each round: the exact minimizer along the aggregated direction, 1/K, or 1 "
        "(CoCoA+'s safe local problems with σ' = K)",
    )
    # "auto" by example for the hinge (the primal kernel needs a smooth loss): the squared
    # hinge on 300 × 20 Gaussian rows, K = 4, took 52 adaptive rounds to 1e-9 by feature,
    # 496 by example, whose rows all span the same 20 directions.
    split: str = option(
        "auto",
        one_of(SPLITS),
        "by feature (the primal) or by example (the dual: L2 only); auto: by example for "
        "the hinge, else by feature",
    )
    callback: object = callback_option()
