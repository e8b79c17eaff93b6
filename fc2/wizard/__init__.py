"""The job wizard (FC² §6, Figs. 3–5): Code → Data → Resource → Review, then Run.

A half-finished wizard lives in the session under SESSION_KEY as plain JSON: the id of the chosen bundle, the dataset
(its id, or the URL of one not stored yet), the parameters and the resource fields — never a file. An upload is
validated and stored as soon as its step is submitted and joins the user's library, so a reload, going back, or a
re-run (`?from=<job id>`) all start from the same small state.

- `forms`: the step forms and their widgets (checking is theirs);
- `state`: the session-stored `Wizard` and the JobRequest its answers make;
- `planning`: the cluster planned for a request, shown on the resource and review steps;
- `views`: the thin views `fc2.urls` routes to.

This package re-exports the names other modules and the tests use.
"""

from fc2.wizard.forms import ALGORITHMS, STEP_FORMS, CodeForm, DataForm, ResourceForm
from fc2.wizard.planning import planned, preview
from fc2.wizard.state import SESSION_KEY, STEPS, Wizard
from fc2.wizard.views import recommendation, start, step

__all__ = [
    "ALGORITHMS",
    "SESSION_KEY",
    "STEPS",
    "STEP_FORMS",
    "CodeForm",
    "DataForm",
    "ResourceForm",
    "Wizard",
    "planned",
    "preview",
    "recommendation",
    "start",
    "step",
]
