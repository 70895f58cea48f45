"""``manage.py plan_capacity``: replicas per tier from demand and measured throughput curves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runtime.scaling.capacity import Curves, Demand, plan
from runtime.scaling.measure import measure_curve


class Command(BaseCommand):
    help = (
        "Plan replicas per hardware tier from a demand file and throughput curves (JSON; see "
        "runtime/scaling/capacity.py), with headroom and zone redundancy z/(z-1); or measure a "
        "tier's curve from a running engine with --measure URL."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--demand", type=Path, help="demand JSON file")
        parser.add_argument("--curves", type=Path, help="throughput curves JSON file")
        parser.add_argument("--headroom", type=float, default=0.2, help="0.2: plan to 80%% load")
        parser.add_argument("--zones", type=int, default=1, help="availability zones (z)")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument("--measure", metavar="URL", help="measure this engine's curve")
        parser.add_argument("--model", help="served model name (with --measure)")
        parser.add_argument("--tier", default="sim", help="tier name (with --measure)")
        parser.add_argument("--kv-tokens", type=int, default=65536, help="(with --measure)")
        parser.add_argument("--batches", default="1,4,16", help="(with --measure)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["measure"]:
            self._measure(options)
            return
        if not options["demand"] or not options["curves"]:
            raise CommandError("give --demand and --curves (or --measure URL --model M)")
        try:
            demand = msgspec.json.decode(options["demand"].read_bytes(), type=Demand)
            curves = msgspec.json.decode(options["curves"].read_bytes(), type=Curves)
            plans = plan(curves, demand, headroom=options["headroom"], zones=options["zones"])
        except (OSError, msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(msgspec.json.encode(plans).decode())
            return
        self.stdout.write(f"{'tier':<12}{'replicas':>9}{'base':>6}  binding  load (replicas)")
        for p in plans:
            load = ", ".join(f"{k} {v:.2f}" for k, v in p.load.items())
            self.stdout.write(f"{p.tier:<12}{p.replicas:>9}{p.base:>6}  {p.binding:<8} {load}")

    def _measure(self, options: dict[str, Any]) -> None:
        if not options["model"]:
            raise CommandError("--measure needs --model")
        batches = tuple(int(b) for b in options["batches"].split(","))
        curve = asyncio.run(
            measure_curve(
                options["measure"].rstrip("/"), options["model"], batches=batches,
                kv_tokens=options["kv_tokens"],
            )
        )  # fmt: skip
        out = Curves(tiers={options["tier"]: curve})
        self.stdout.write(msgspec.json.format(msgspec.json.encode(out)).decode())
