"""The caching methods, one module each: its rule (the Interceptor class) next to its node's declaration."""
