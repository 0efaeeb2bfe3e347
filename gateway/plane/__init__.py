"""The bus-wide routing plane: where Channels and Respondents are, and forwarding."""
