"""The web page: static HTML, CSS and JavaScript, served as they are (no build step)."""
