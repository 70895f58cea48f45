"""Safety filtering off the request path: policy packs compiled once, checked cheaply.

:mod:`.detectors` the PII recognizers by name; :mod:`.rules` validation and compilation of a
pack (one combined regex per action); :mod:`.prefilter` the input check (pass, refuse, redact);
:mod:`.postfilter` the streaming output check with a sliding window. Pure code: no I/O, no
Django, no Redis; the gateway's stages call it.
"""
