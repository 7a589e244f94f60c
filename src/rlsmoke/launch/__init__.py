"""Launch rendering (`miles.py`) and running (`runner.py`)."""
