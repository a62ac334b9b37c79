"""User code: script mode (``script``: a command of the user's under the pipeline) and the scaffolds (``scaffold``:
``thrifty new recipe|script``). The users' facade stays at ``thrifty.session``. May import everything in
``thrifty`` below the CLI; the scaffolds' templates name ``training`` only as text, never as an import.
"""
