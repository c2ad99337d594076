"""The Designer's parts: the block palette, the canvas adapter, the automatic layout and the figures.

Everything here except `palette.blocks()` is a pure function over plain dicts (the cell JSON of
engine.to_dict, and the canvas's editor schema as a dict), so it is tested without a browser.
"""
