"""The read side the REST API and the admin share: what a run's log shows.

- :mod:`.projections`: the named projections they may fold and show.
"""
