"""The request path's stages, one module each (their order: ``pipeline.build``)."""
