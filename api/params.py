"""Query parameter and header types under the input rule (``raylane.orchestrator.domain.inputs``).

``Text``: a string without NUL, valid UTF-8, bounded (a NUL in a label filter
gave PostgreSQL's 500). ``When``: a datetime inside the calendar window where
window arithmetic cannot overflow (the edges gave 500 on /v1/costs and /v1/report).
A violation is a 422 whose ``loc`` names the parameter.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator

from raylane.orchestrator.domain import inputs

Text = Annotated[str, AfterValidator(inputs.text)]
When = Annotated[datetime, AfterValidator(inputs.date)]
