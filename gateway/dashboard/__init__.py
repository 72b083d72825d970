"""The admin dashboard: one static HTML page polling a JSON endpoint of this gateway process."""
