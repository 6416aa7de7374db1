"""capability_db: facts (TOML/JSON data) shipped with moedispatch; every entry names its source."""
