"""A simulated vLLM OpenAI-compatible server for tests and fire drills.

* `simulator.engine.Engine`: continuous batching with an injected clock (`advance_to(t)`).
* `simulator.metrics.render(engines, flavour)`: the `/metrics` page (v0/v1, multiprocess, N engines;
  `sglang` with TP/DP ranks; `llamacpp` like llama-server b11434). `--engine sglang|llamacpp` also
  switches the HTTP behaviour (llama.cpp: /metrics hangs in an idle stall, Process-Start-Time-Unix
  header, 503 "Loading model" with --load-seconds; SGLang: /health 503 after 20 s of stall).
* `simulator.server.Simulator(SimConfig(...))`: the HTTP server (`with Simulator(cfg) as sim: sim.url`).
* `llm-health sim --port P [--control-port C] ...` / `python -m llm_health.simulator ...`: the same as a process.
* `python -m llm_health.simulator.ctl restart|fault NAME|stats URL`: control it without a shell (exit 0 on 2xx).

Faults (`POST /sim/fault {"fault": NAME, "seconds"?: n}`, on the main or the control port):
none, stall (engine stops stepping; /health 200, /metrics frozen), wedge (like stall, and the /metrics
page stays exactly as it was at the wedge, gauges included: an idle server keeps showing 0 running /
0 waiting while every generation request, the probe too, waits forever), hang (main port accepts but never
answers), crash (main port refused), restart (in-flight requests fail 500, port closed for
--restart-seconds, then a new process: new start time, counters reset), slow_metrics, error
(generation requests, streaming too, answer 500 with vLLM's OpenAI error JSON while /health,
/v1/models and /metrics stay fine; `none` or `restart` clears it).
`seconds` (engine seconds, divided by --time-scale): stall/wedge/hang/error clear themselves after it; crash
restarts after it; restart uses it as downtime; slow_metrics delays /metrics by it (default 3).
`none` after a crash brings the port back as a new process. Other faults while the port is down -> 409.
`/sim/*` requests are not counted in `/sim/stats`.
"""
