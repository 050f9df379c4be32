"""One module per mart, named after its table."""
