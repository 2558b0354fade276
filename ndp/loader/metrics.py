"""``loader.telemetry()`` exported: a Prometheus collector and endpoint (``prometheus_client``,
the ``metrics`` extra), and the line that logs it to TensorBoard or Weights & Biases.

    server, port = ndp.serve_metrics(loader, port=9400)      # http://host:9400/metrics

    # TensorBoard, every N steps:
    for name, value in ndp.telemetry_scalars(loader).items():
        writer.add_scalar(name, value, step)
    # Weights & Biases:
    wandb.log(ndp.telemetry_scalars(loader), step=step)

The collector reads the loader's figures at each scrape (``ndp.loader.telemetry``), on the
server's thread: nothing is counted twice, and a scrape never waits for the epoch's count (the
batches left are left out until it is known).
"""

from __future__ import annotations

from typing import Any

from ndp.errors import ConfigError
from ndp.loader.telemetry import scalars, telemetry


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("exporting to Prometheus needs prometheus_client: pip install "
                          "'neural-datagram[metrics]'") from None
    return prometheus_client


class LoaderCollector:
    """A ``prometheus_client`` collector of one Loader's figures, labelled by rank (register
    it with ``registry.register``)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def collect(self) -> Any:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        f = telemetry(self.loader)
        rank = str(f["rank"])

        def counter(name: str, doc: str, value: float) -> Any:
            m = CounterMetricFamily(f"ndp_{name}", doc, labels=["rank"])
            m.add_metric([rank], value)
            return m

        def gauge(name: str, doc: str, value: float) -> Any:
            m = GaugeMetricFamily(f"ndp_{name}", doc, labels=["rank"])
            m.add_metric([rank], value)
            return m

        yield counter("batches", "batches handed out", f["batches"])
        yield counter("tokens", "tokens delivered", f["tokens"])
        yield counter("packets", "packets taken into batches", f["packets"])
        yield counter("valid_packets", "valid packets taken into batches", f["valid"])
        yield counter("dropped_on_purpose_packets", "packets CRC-Drop left out",
                      f["dropped_on_purpose"])
        yield counter("skipped_batches", "batches of skipped steps", f["skipped_batches"])
        yield counter("thread_cpu_seconds", "CPU seconds of ndp's threads",
                      f["ndp_thread_cpu_seconds"])
        corrupt = CounterMetricFamily("ndp_dropped_packets", "packets dropped, by reason",
                                      labels=["rank", "reason"])
        for reason, n in sorted(f["corrupt"].items()):
            corrupt.add_metric([rank, reason], n)
        yield corrupt
        yield gauge("epoch", "the epoch the loop is in", f["epoch"])
        yield gauge("step", "the run step of the next batch", f["step"])
        if f["remaining"] is not None:
            yield gauge("batches_remaining", "batches left in the epoch", f["remaining"])
        yield gauge("tokens_per_second", "tokens delivered per second since the first batch",
                    f["tokens_per_s"])
        yield gauge("wait_max_seconds", "the longest wait of next()", f["wait_max_s"])
        hist = HistogramMetricFamily("ndp_wait_seconds", "the wait of each next()",
                                     labels=["rank"])
        hist.add_metric([rank], [(("+Inf" if b == float("inf") else repr(b)), n)
                                 for b, n in f["wait_histogram"]],
                        sum_value=f["wait_seconds"])
        yield hist


def serve_metrics(loader: Any, *, port: int = 9400, addr: str = "127.0.0.1",
                  registry: Any = None) -> tuple[Any, int]:
    """Serve ``loader``'s figures at ``http://addr:port/metrics`` from a thread of
    ``prometheus_client`` (``port=0``: any free port): the server and the port. ``registry``:
    a ``CollectorRegistry`` to add them to (default: a new one of their own). ``addr``:
    ``"0.0.0.0"`` to be scraped from other hosts."""
    client = _client()
    registry = registry if registry is not None else client.CollectorRegistry()
    registry.register(LoaderCollector(loader))
    server, _ = client.start_http_server(port, addr=addr, registry=registry)
    return server, int(server.server_port)


def telemetry_scalars(loader: Any, prefix: str = "ndp/") -> dict[str, float]:
    """``loader.telemetry()`` as flat ``{name: float}`` for ``SummaryWriter.add_scalar`` or
    ``wandb.log`` (the batches left out until the epoch's count is known)."""
    return scalars(telemetry(loader), prefix)
