"""The training search and the questions on top of it: enumerate every layout (space), evaluate and
rank them (rank), advise when nothing fits (advice), run.py ties them into a SearchResult
(result); plan.py finds the fewest GPUs for a goal, compare.py where a given layout ranks."""
