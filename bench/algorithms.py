"""The names of the seven algorithms, in the order the leaderboard shows them.

A constant that neither the trainer nor the app owns: the losses live in runners/algos.py
(which registers exactly these names; a test keeps the two equal) and the leaderboard reads
only the store and this list, so it can show cells that have not been run yet."""

ALGORITHMS = ("pg-seq-is", "pg-seq-tis", "pg-seq-mis", "grpo", "grpo-token-tis", "grpo-seq-mis", "gspo")
