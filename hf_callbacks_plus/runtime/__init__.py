"""What the callbacks need from the running process: console messages, the process group
(ranks, broadcasts, sums), random-state preservation and an evaluation that leaves no trace.

Below the features, above the metrics; knows the trainers' conventions but imports no runner
(see ``docs/architecture.md``).
"""
