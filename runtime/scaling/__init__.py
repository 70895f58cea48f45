"""Autoscaling: per-pool signals from the routers, scaling policies and the controller math,
and the capacity planner. Pure functions and small I/O adapters; the control plane's
``apps/scaling`` records decisions and runs the actuators."""
