"""Forecasts of request rate, with uncertainty bands and operator-declared events.

`Forecaster.fit(series)` returns a `FittedForecaster`, whose `update(values)` absorbs new
observations cheaply (every control tick) and whose `predict(steps)` returns a
`Forecast`. Only `forecaster.smoothing` (Holt, Holt-Winters, MSTL) imports statsmodels,
and only when a spec builds one.
"""
