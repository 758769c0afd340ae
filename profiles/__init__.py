# profiles -- named tuning profiles (TOML) shipped with rtkit; see rtkit/config.py for the format.
