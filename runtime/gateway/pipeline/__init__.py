"""The request path as a pipeline of stages (issue #27).

- :mod:`.context`: :class:`RequestContext`, one request's decisions and holds, with the one
  release mechanism (its exit stack; early releases before the response's last byte);
- :mod:`.stage`: the :class:`Stage` protocol and the :class:`Pipeline` runner;
- :mod:`.stages`: one module per stage; :mod:`.build`: their order.
"""
