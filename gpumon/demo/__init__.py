"""``gpumon demo``: the whole loop, live, on a local cluster (docs/demo.md). Pure parts:
scenario (the file), fleet (what to create and how to configure it), views (what is seen),
expect (the state each step waits for), agents' assignments, render (table and log lines).
I/O shells: agents, exporters, observe, orchestrate, command."""
