"""The catalogue of words: every reason, status and error as a pt-BR and an English sentence, the texts Lembra sends, and the keywords patients write."""
