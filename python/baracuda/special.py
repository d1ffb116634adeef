"""torch.special names over baracuda.functional."""
from .functional import (digamma, erf, erfc, exp2, expm1, lgamma as gammaln, log1p, logit, round,  # noqa: F401
                         sigmoid as expit)

psi = digamma

__all__ = ["digamma", "erf", "erfc", "exp2", "expit", "expm1", "gammaln", "log1p", "logit", "psi", "round"]
