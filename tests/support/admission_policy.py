"""A ValidatingAdmissionPolicy's decision on one request, evaluated with a real CEL implementation (cel-expr-python).

Follows the admissionregistration.k8s.io/v1 types (kubernetes/api admissionregistration/v1/types.go @10b39a3) and
the evaluation order of k8s.io/apiserver pkg/admission/plugin/policy/validating: the policy applies only when every
matchCondition is true; variables are bound in order, each seeing the ones before it as ``variables.<name>``;
every validation must be true, and an error counts as a failure under ``failurePolicy: Fail``. ``object`` is null
on DELETE and ``oldObject`` on CREATE. Not the same: the variables are maps of dyn, not typed from the OpenAPI
schema (a type error shows only when an expression runs), the ``authorizer``, ``params`` and ``namespaceObject``
variables and the cost limits are absent, and matchConstraints (which resources and operations) are the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cel_expr_python import cel

from tests.support.dra_cel import POOL

_MAP = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
ENV = cel.NewEnv(
    POOL, variables={"request": _MAP, "object": cel.Type.DYN, "oldObject": cel.Type.DYN, "variables": _MAP}
)


def _eval(expression: str, data: Mapping[str, Any]) -> Any:
    result = ENV.compile(expression).eval(data=dict(data))
    if result.type() == cel.Type.ERROR:
        raise RuntimeError(f"{expression!r}: {result.value()}")
    return result.plain_value()  # plain Python values all the way down, so a variable can be fed back in


def decide(policy: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[bool, str]:
    """(allowed, message) for an admission request (``operation``, ``userInfo``, ``object``, ``oldObject``)."""
    spec = policy["spec"]
    data: dict[str, Any] = {
        "request": {k: v for k, v in request.items() if k not in ("object", "oldObject")},
        "object": request.get("object"),
        "oldObject": request.get("oldObject"),
        "variables": {},
    }
    try:
        if not all(_eval(c["expression"], data) is True for c in spec.get("matchConditions") or []):
            return True, "policy does not apply"
        for variable in spec.get("variables") or []:
            data["variables"] = {**data["variables"], variable["name"]: _eval(variable["expression"], data)}
        for validation in spec["validations"]:
            if _eval(validation["expression"], data) is not True:
                if "messageExpression" in validation:
                    return False, str(_eval(validation["messageExpression"], data))
                return False, validation.get("message", validation["expression"])
    except RuntimeError as e:
        if spec.get("failurePolicy", "Fail") == "Fail":
            return False, str(e)
        return True, f"ignored: {e}"
    return True, ""
