"""Stand-in ``nki.isa``: every name a recording raiser."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def api(*args, **kwargs):
        import nki

        return nki.record(f"nki.isa.{name}", args, kwargs)

    api.__name__ = api.__qualname__ = name
    api.__module__ = __name__
    globals()[name] = api
    return api
