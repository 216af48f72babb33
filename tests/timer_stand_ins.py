"""Stand-in GPU timers for the benchmarks' CPU tests: every candidate still runs once (the code under test is
exercised on the interpreter) and gets the time the test chooses."""
from benchmarks import timers


def stand_in_timers(monkeypatch, ran: list, time_of) -> None:
    """``timers.interleaved_ms`` runs each candidate once, appends its name to `ran` and gives it time_of(name) ms;
    ``timers.ms`` runs its function and gives 1 ms."""
    def interleaved(candidates, rounds=5, rep=100):
        for name, fn, _ in candidates:
            fn()
            ran.append(name)
        return {name: time_of(name) for name, _, _ in candidates}, 1.0

    monkeypatch.setattr(timers, "interleaved_ms", interleaved)
    monkeypatch.setattr(timers, "ms", lambda fn, rep=100: (fn(), 1.0)[1])
