"""Stand-in ``nki.language``: a class for kernel tile plans; every other name a recording raiser."""


class NKIObject:
    """Base of compile-time objects passed to kernels (as in AWS's nki.language)."""


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def api(*args, **kwargs):
        import nki

        return nki.record(f"nki.language.{name}", args, kwargs)

    api.__name__ = api.__qualname__ = name
    api.__module__ = __name__
    globals()[name] = api
    return api
