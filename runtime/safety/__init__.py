"""Safety filtering off the request path: policy packs compiled once, checked cheaply.

:mod:`.detectors` the PII recognizers by name; :mod:`.rules` what a pack may say and its field
errors; :mod:`.compiled` packs compiled per version (:class:`.compiled.PackCache`);
:mod:`.prefilter` the input check (pass, refuse, redact); :mod:`.classify` classifier rules
through an injected model client; :mod:`.postfilter` the streaming output check with a sliding
window; :mod:`.events` the intervention events. Pure code: no I/O, no Django, no Redis; the
gateway's stages call it.
"""
