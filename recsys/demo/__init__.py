"""Generated logs for the demo and the benchmarks: a click log with the shapes of real ones
(``clicklogs``, ``recsys-synth``) and a log with planted interactions and a known oracle
(``planted``)."""
