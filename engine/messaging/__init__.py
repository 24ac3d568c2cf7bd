"""Messages on the wire: templates and rendering, dispatch (checks, waves of provider calls, outcomes), inbound messages and provider statuses, conversations, linking a channel's phone."""
