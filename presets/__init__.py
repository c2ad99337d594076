"""The preset gallery: one DSL file per known cell variant (see engine.gallery)."""
