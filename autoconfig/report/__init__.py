"""Rendering of results: terminal tables now; CSV/HTML reports and launch-flag exports later."""
