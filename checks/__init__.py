"""Checkers the test suite and the long runs use: hostile input (fuzz), crash consistency,
forensic forget scans and the secrets screen evaluation. Installed (their commands are
``engram-memory fuzz``, ``crash`` and ``eval-secrets``); the server never imports them."""
