"""The default admission policy and its secrets screen: rules, layouts, the statement judge and the
learned screen (one way: secrets -> rules, secret_layouts -> statements -> rules, secret_model).
May import ``retrieval`` and ``models`` only."""
