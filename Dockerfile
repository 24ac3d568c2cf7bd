FROM python:3.11-slim
WORKDIR /app
COPY . /app
# Editable install keeps sql/ (the migrations) next to the code that applies them.
RUN pip install --no-cache-dir -e . && useradd --system lembra
USER lembra
ENV LEMBRA_LOG_FORMAT=json
CMD ["lembra", "web"]
