"""`haremq perf`: a PerfTest-style load tool for any AMQP 0-9-1 broker.

    tool.py      the command line, the run's orchestration and the JSON summary
    workers.py   producer and consumer processes
    amqp.py      the minimal AMQP client they use
    stats.py     latency samples and CPU figures

It imports nothing of HareMQ. It lives with the `haremq` command (cluster/cli.py)
so that the command imports nothing from a layer above it; the benchmarks in
bench/ use it from here, and `python -m haremq.bench.perf` still runs it.
"""
