"""The operator console in the browser (``engram-memory console``): server/console/app.py."""
