"""What surrounds a fit of the dask engines: its client (found once, for the whole fit),
the dashboard link, a ``distributed.performance_report`` and, on a dask-jobqueue cluster,
the default checkpoint (:func:`dask_scd.runtime.jobqueue.walltime_defaults`)."""

from __future__ import annotations

import contextlib

from dask_scd.progress import resolve_mode
from dask_scd.runtime import jobqueue
from dask_scd.runtime.cluster import fit_client
from dask_scd.validation import warn


@contextlib.contextmanager
def fit_session(on_cluster: bool, options: dict, verbose, identity: dict, performance_report=None):
    """Prepare ``options`` (the engine's, changed in place) for a fit.

    ``on_cluster``: the engine runs on a dask cluster (else only a warning that
    ``performance_report`` has nothing to report). ``identity``: what names the default
    checkpoint of a fit on a jobqueue cluster.
    """
    if not on_cluster:
        if performance_report is not None:
            warn(
                "performance_report applies to the dask engines; this fit runs in memory "
                "(pass solver='block_scd' or 'block_newton' to use it)"
            )
        yield options
        return
    with fit_client(options.get("client")) as client:
        options["client"] = client
        if resolve_mode(verbose) != "off":
            print(f"dask dashboard: {client.dashboard_link}")
        path = jobqueue.walltime_defaults(client, options, identity)
        if path is not None and resolve_mode(verbose) != "off":
            print(f"checkpoint every {options['checkpoint_every']} epochs: {path}")
        if performance_report is None:
            yield options
            return
        try:
            import bokeh  # noqa: F401  (the report's plots)
        except ImportError:
            raise ImportError(
                "performance_report needs bokeh: pip install 'dask-scd[diagnostics]'"
            ) from None
        from distributed import performance_report as report

        with client.as_current(), report(filename=str(performance_report)):
            yield options
