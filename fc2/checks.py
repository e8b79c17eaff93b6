"""System checks shown when the platform starts (runserver, `manage.py check`, the worker's setup): what an operator
must know before users submit jobs."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register

from provisioner import sandbox


@register(Tags.security, deploy=False)
def local_sandbox(app_configs, **kwargs) -> list[Warning]:
    """Local jobs run researchers' code on this machine: say so when it cannot be sandboxed."""
    reason = sandbox.unavailable()
    if reason is None:
        return []
    if settings.FC2_UNSANDBOXED_LOCAL_JOBS:
        return [
            Warning(
                f"local jobs run unsandboxed, as the platform's own user ({reason})",
                hint="Any local job can read the platform's database and secrets: keep this to a single-user machine.",
                id="fc2.W002",
            )
        ]
    return [
        Warning(
            f"local jobs are refused: they need the sandbox, and {reason}",
            hint="Run the platform as root with bubblewrap, util-linux and iproute2 installed, or on a single-user "
            "machine set FC2_UNSANDBOXED_LOCAL_JOBS=1.",
            id="fc2.W001",
        )
    ]
