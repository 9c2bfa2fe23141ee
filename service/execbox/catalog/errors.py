"""The catalog's errors: a language, policy or image variant that is not on offer, or a request over a
policy's ceilings. Codes are listed in docs/api.md, the whole tree in docs/architecture.md."""

from __future__ import annotations

from execbox.core.errors import FieldProblem, RequestError


class UnknownLanguage(RequestError):
    code = "request.unknown_language"

    def __init__(self, language: str, known: list[str]) -> None:
        super().__init__(
            f"unknown language {language!r}; use one of {', '.join(known)} (GET /v1/languages)",
            (FieldProblem("language", f"must be one of {', '.join(known)}"),),
        )


class LanguageNotFound(RequestError):
    code = "language.not_found"
    http_status = 404

    def __init__(self, language: str, known: list[str]) -> None:
        super().__init__(f"no language {language!r} here; this service runs {', '.join(known)}")


class UnknownPolicy(RequestError):
    code = "request.unknown_policy"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"unknown policy {name!r}; use one of {', '.join(known)}",
            (FieldProblem("policy.name", f"must be one of {', '.join(known)}"),),
        )


class PolicyExceeded(RequestError):
    code = "request.policy_exceeded"

    def __init__(self, problems: tuple[FieldProblem, ...]) -> None:
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems), problems)


class VariantNotAllowed(RequestError):
    code = "request.variant_not_allowed"

    def __init__(self, language: str, policy: str, allowed: list[str], field: str) -> None:
        allows = ", ".join(allowed) or "none"
        super().__init__(
            f"{language!r} is an image variant policy {policy!r} does not allow (it allows: {allows})",
            (
                FieldProblem(
                    field,
                    f"{language!r} is not allowed under policy {policy!r} (it allows: {allows}); use the language "
                    f"without a variant, another policy, or ask the operator to add it to policies/{policy}.yaml "
                    "`variants`",
                ),
            ),
        )


__all__ = ["LanguageNotFound", "PolicyExceeded", "UnknownLanguage", "UnknownPolicy", "VariantNotAllowed"]
