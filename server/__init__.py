"""The MCP adapter: launch config, tool registry, confirmation gate, call pipeline and the CLI.

No business rule lives here: validation is models/, every decision on memory is store/.
"""
