FROM python:3.11-slim
WORKDIR /app
COPY . /app
# Editable install keeps sql/ (the migrations) next to the code that applies them.
RUN pip install --no-cache-dir -e . && useradd --system lembra
USER lembra
ENV LEMBRA_LOG_FORMAT=json
# web (/healthz, /metrics), worker metrics, scheduler metrics
EXPOSE 8000 9191 9192
CMD ["lembra", "web"]
