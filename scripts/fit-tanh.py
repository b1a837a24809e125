"""Fits the rational approximation of tanh that the CPU kernels use (runtime/cpu/fast_exp.h, tanhFloat):

    tanh(x) ~= x * P(x^2) / Q(x^2) on [0, 9], P of degree 4, Q of degree 4 with Q(0) = 1,

by weighted linear least squares on P(y) - f(y) Q(y) = 0 (f = tanh(x) / x, y = x^2), reweighted toward the
largest relative errors (Sanathanan-Koerner with Lawson-style weights), keeping the best iterate. Prints the
coefficients rounded to float and the largest relative error of the float evaluation (Horner, no FMA) over
[-12, 12] and down to 1e-30, against float64 tanh. Beyond |x| = 9, tanh rounds to 1 within 3e-8.

    .venv/bin/python scripts/fit-tanh.py
"""
import numpy as np

CLAMP = 9.0
P_DEGREE, Q_DEGREE = 4, 4


def fit(p_degree, q_degree, iterations=60):
    x = np.concatenate([np.linspace(0, CLAMP, 20000), CLAMP * (1 - np.cos(np.linspace(0, np.pi / 2, 20000)))])
    x = np.unique(x[x > 0])
    y, f = x * x, np.tanh(x) / x
    q_prev, weight, best = np.ones_like(y), np.ones_like(y), None
    for _ in range(iterations):
        lhs = np.hstack([np.vander(y, p_degree + 1, increasing=True),
                         -(f[:, None] * np.vander(y, q_degree + 1, increasing=True)[:, 1:])])
        scale = weight / (np.abs(q_prev) * f)
        coef, *_ = np.linalg.lstsq(lhs * scale[:, None], f * scale, rcond=None)
        p, q = coef[:p_degree + 1], np.concatenate([[1.0], coef[p_degree + 1:]])
        q_prev = np.polyval(q[::-1], y)
        err = np.abs(np.polyval(p[::-1], y) / q_prev - f) / f
        weight = weight * (1 + err / err.max())
        weight /= weight.mean()
        if best is None or err.max() < best[0]:
            best = (err.max(), p.copy(), q.copy())
    return best


def float_tanh(p, q, x):
    """The approximation as tanhFloat evaluates it, in float (Horner without FMA)."""
    p32, q32 = [np.float32(c) for c in p], [np.float32(c) for c in q]
    a = np.minimum(np.abs(x), np.float32(CLAMP)).astype(np.float32)
    y = (a * a).astype(np.float32)
    num, den = np.full_like(y, p32[-1]), np.full_like(y, q32[-1])
    for c in p32[-2::-1]:
        num = (num * y + c).astype(np.float32)
    for c in q32[-2::-1]:
        den = (den * y + c).astype(np.float32)
    return np.copysign(np.minimum((a * num / den).astype(np.float32), np.float32(1)), x)


def main():
    fit_err, p, q = fit(P_DEGREE, Q_DEGREE)
    x = np.concatenate([np.linspace(-12, 12, 2000001), np.float32(10.0) ** np.linspace(-30, 1, 20001)]).astype(np.float32)
    ref = np.tanh(x.astype(np.float64))
    rel = np.abs(float_tanh(p, q, x).astype(np.float64) - ref) / np.maximum(np.abs(ref), 1e-300)
    print(f"fit: max relative error {fit_err:.3g} (float64); float evaluation: {rel.max():.3g} at x = {x[rel.argmax()]:g}")
    print("P:", ", ".join(f"{np.float32(c):.9g}f" for c in p))
    print("Q:", ", ".join(f"{np.float32(c):.9g}f" for c in q))


if __name__ == "__main__":
    main()
