"""Everything that draws for people (rich) lives here; stages only hand it data."""
