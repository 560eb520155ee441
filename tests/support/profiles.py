"""The simulator profiles of the tests: one set, in one place. A test module writes
TEST_PROFILES to a file and names its pools' profiles from it (tests/sim/simproc.py
`sim_with_profiles`); a variation of one pool only is a `--pool` override
(`quick:stream_usage=false`), which keeps the profile's name.

A profile's name is part of what the simulator answers: its `system_fingerprint` and the
hashes that pick the diverging, truncated and wrong answers include it. So a profile here is
only renamed where it diverges from nothing (divergence_rate 0), and two profiles with the
same fields and different names would not be interchangeable: there are none.
"""

from __future__ import annotations

# Small, fast profiles so the suite runs in seconds on 2 cores. Steps of a few ms keep
# requests short; the pools that test queueing and prefill are slowed down on purpose.
# No replica noise (the built-ins have a little) unless a profile says so: tests that
# compare answers stay exact.
TEST_PROFILES = """
[profiles.quick]
base = "h200"
decode_base_ms = 2.0
decode_per_seq_ms = 0.01
network_latency_ms = 0.0
divergence_rate = 0.0
replica_noise = 0.0
max_context = 4096
kv_cache_tokens = 400000

[profiles.quick-twin]
base = "mi300x"
decode_base_ms = 3.0
decode_per_seq_ms = 0.01
network_latency_ms = 0.0
divergence_rate = 0.0
replica_noise = 0.0
max_context = 4096

[profiles.diverging]
base = "quick"
divergence_rate = 0.25
near_tie_fraction = 0.5

[profiles.tie]
base = "quick"
divergence_rate = 1.0
near_tie_fraction = 1.0

[profiles.flip]
base = "quick"
divergence_rate = 1.0
near_tie_fraction = 0.0

# A candidate clearly worse than quick: 60 % of its answers diverge, all as hard flips.
[profiles.shadow-regressed]
base = "quick"
divergence_rate = 0.6
near_tie_fraction = 0.0

# Replica noise (GPU batch nondeterminism): the built-ins' little (a primary's noise floor),
# and much, so that a few pairs of answers show it.
[profiles.replica]
base = "quick"
replica_noise = 0.05

[profiles.shadow-noisy]
base = "quick"
replica_noise = 0.5

# Saturating: two sequences at a time, or one with one waiting (20 ms a step).
[profiles.narrow]
base = "quick"
decode_base_ms = 20.0
max_seqs = 2
max_waiting = 64

[profiles.small]
base = "quick"
decode_base_ms = 20.0
max_seqs = 1
max_waiting = 1

# Slower decode steps, nothing else: runs that last (15 ms: 600 rows at concurrency 8 take
# some 20 s) and a candidate slower than its primary (40 ms).
[profiles.slow-15ms]
base = "quick"
decode_base_ms = 15.0

[profiles.slow-40ms]
base = "quick"
decode_base_ms = 40.0

[profiles.prefill]
base = "quick"
prefill_tokens_per_s = 4000.0

# Known timing for the benchmark runner's tests: network latency 0, one shared step time for
# any batch (decode_per_seq_ms 0), prefill 20,000 tok/s: a 600-token prompt adds 30 ms to
# the step that emits its first token.
[profiles.paced]
base = "h200"
decode_base_ms = 20.0
decode_per_seq_ms = 0.0
prefill_tokens_per_s = 20000.0
network_latency_ms = 0.0
divergence_rate = 0.0
max_context = 8192
kv_cache_tokens = 400000
prefix_cache_tokens = 16384

[profiles.quick-other]
base = "quick"
tokenizer = "other"

# The legacy A100 serving stack (no tool parsing, another tokenizer) at quick's speed; its
# replica noise is the built-in A100's.
[profiles.legacy]
base = "a100-legacy"
decode_base_ms = 2.0
decode_per_seq_ms = 0.01
network_latency_ms = 0.0
divergence_rate = 0.0
max_context = 4096
"""
