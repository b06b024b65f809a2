"""Bounds the screen's modules share, in a module of their own: the policy reads them without
importing the screen (store/screen/lazy.py)."""

MIN_SECRET_CHARS = 4  # find_secret (secrets.py) passes anything shorter without a rule or the model
