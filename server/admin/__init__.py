"""The host's maintenance commands (never agent tools, never over MCP): ``engram-memory admin ...``
and ``rebuild-index``, and the host-only routes a data dir's owner answers on its socket.

options.py holds what every command shares; each other module holds one group of commands on its
own ``commands`` app; app.py builds ``admin_app`` from the groups. Imports go one way: the groups
import options.py (and socket_routes.py), app.py imports the groups, and only server/cli.py imports
app.py. Nothing here imports server/cli.py or another group.
"""
