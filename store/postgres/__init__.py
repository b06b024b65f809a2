"""PostgreSQL store backend (issue 22), in progress: schema and URL rules so far; not yet selectable for serving."""
