"""The training search: enumerate every layout (space), evaluate and rank them (rank), advise
when nothing fits (advice); run.py ties them together into a SearchResult (result)."""
