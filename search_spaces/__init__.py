"""Search spaces as data (installed as ``autotune.search_spaces``); copy one and pass it with --space."""
