"""The typed wire between the exporter and the controller, one module per schema version.

Both ends import it: the exporter serialises its snapshot and watch lines through these
models, the controller parses them with the same models. Purely data and parsing: it imports
nothing from the exporter or the controller, and no HTTP library.
"""
