"""Safety: policy packs (named, versioned rule sets), who they apply to, and the interventions
the routers report (issue #31). The rules' grammar and field errors are the data plane's
(:mod:`runtime.safety.rules`); this app stores, validates and publishes them."""
